from pyrula.cli.main import main

main()
