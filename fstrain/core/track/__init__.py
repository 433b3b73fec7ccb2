"""What fstrain sends an experiment tracker (MLflow, Weights & Biases): the launch's parameters,
every rank's step numbers and the run's end, as values (calls.py). Pure: fstrain/io/trackers.py
sends them."""
