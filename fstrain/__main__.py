from fstrain.cli.main import main

main()
