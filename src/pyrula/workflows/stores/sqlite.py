class SQLiteStore:
    pass
