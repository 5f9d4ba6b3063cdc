"""The worker: pulls jobs from the arq queue, drives the engine, publishes events to job streams."""
