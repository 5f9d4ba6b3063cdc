"""Pure conversions between other APIs' shapes (OpenAI, TGI) and streampool's jobs and events."""
