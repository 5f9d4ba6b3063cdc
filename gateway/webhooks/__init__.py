"""Webhooks: a job's end POSTed, signed, to the URL its request or its API key names.

`targets` decides a job's webhook at submission (annotations kept in the job's record);
the lifecycle scripts that end a job announce its end on the webhooks stream in the same step
(`shared/lifecycle/announce_end.lua`); `sender` (every gateway runs one) delivers each
announcement, signed by `signing`, and keeps its record through `deliveries`.
"""
