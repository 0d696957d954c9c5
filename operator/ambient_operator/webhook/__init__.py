"""The redirection-wait admission webhook (issue 6): decide, certs, config, server, misses.

Nothing is imported here: the dev cluster uses `certs` alone, without the
server and its HTTP stack.
"""
