from sftdoctor.cli import main

main()
