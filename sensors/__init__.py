"""Jobs, schedules and sensors: ``cycle`` (a 15-minute schedule), ``maintenance_trigger`` (a
trigger sensor) and ``partitions``, every trigger stopped by default; each module
exports ``JOBS``, ``SCHEDULES`` and ``SENSORS``."""
