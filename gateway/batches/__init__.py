"""OpenAI's Batch API on the job queue: a batch's record (`store`) and what its input lines become
(`lines`); the gateway that drives a batch is `gateway.batch_driver`."""
