"""`fstrain report`: a run's numbers (series.py, events.py, excerpt.py, numbers.py) and the page
that plots them (svg.py, page.py). Pure: values in, values out; fstrain/api/report.py gathers the inputs."""
