"""Calibration (``fstrain plan --calibrate``): measured numbers in place of the planner's assumptions.
Pure. Above the planner and the documents it reads, the bench's and the report's, both of which
build on the planner.

- :mod:`.calibrate`: a bench document, a run's report or the trainer's summary -> assumptions
"""
