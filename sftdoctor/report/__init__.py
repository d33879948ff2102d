"""`sftdoctor report`: a run's curves in pictures, read by the curve readers (checks/curves.py)."""
