"""`sftdoctor diff RUN_A RUN_B`: what differs between two runs, the likely causes first."""
