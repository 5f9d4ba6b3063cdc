"""Files of OpenAI's Files API (batch input, output and error files): bytes in a storage outside Redis,
metadata in Redis."""
