"""Hosts: which machines a command runs on, and which keys they may show. Pure: text in, values out.

- :mod:`.hostfile`: DeepSpeed hostfiles, plain host lists, Slurm host lists, include/exclude
- :mod:`.knownhosts`: OpenSSH ``known_hosts``: markers, hashed names, patterns, bad lines
"""
