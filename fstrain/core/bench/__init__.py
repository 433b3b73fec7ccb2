"""`fstrain bench` as values: the arithmetic of its measurements and the reading of its document.

- :mod:`.arithmetic`: message sizes, algorithm and bus bandwidth, statistics, the worker's argv
- :mod:`.pairs`: node-to-node rounds, and who is to blame for a slow link
- :mod:`.report`: a bench document's rows, verdicts and bar charts
- :mod:`.checks`: a bench document's outliers as `fstrain doctor --bench` verdicts

The programs that measure (torch on the nodes) are in :mod:`fstrain.bench`.
"""
