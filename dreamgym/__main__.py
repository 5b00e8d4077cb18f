from dreamgym.cli import main

main()
