"""Jobs, schedules and sensors: ``cycle`` (every 15 minutes and on new activity) and
``maintenance``; each module exports ``JOBS``, ``SCHEDULES`` and ``SENSORS``."""
