"""What the gateway and the workers share: settings, Redis key names, wire models, job store."""
