-- Dispatch: ARGV[1] names the operation (a table lookup, not a chain of string compares).
local op = ops[ARGV[1]] or limits().ops[ARGV[1]]
if op == nil then return redis.error_reply('ERR pyrula: unknown operation ' .. tostring(ARGV[1])) end
return op(KEYS, ARGV)
