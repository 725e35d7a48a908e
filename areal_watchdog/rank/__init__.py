"""Code that runs inside a training rank: the rank entry wrapper, heartbeats, the Flight Recorder
listener.
"""
