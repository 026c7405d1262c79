from specgen.cli import main

main()
