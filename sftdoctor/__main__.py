from sftdoctor.cli import main

main(prog_name="sftdoctor")  # the name users type, not "python -m sftdoctor", in usage lines
