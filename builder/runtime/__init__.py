"""The sandbox runtime server that every built image carries (copied to /opt/sandbox/server.py)."""
