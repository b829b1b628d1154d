"""The server: connecting (URLs, TLS, secrets), standalone or Cluster, what a server can do, its memory.

Everything above this layer takes a connected client; nothing here knows what a filter is.
"""
