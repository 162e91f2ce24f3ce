from potluck.cli import main

main()
