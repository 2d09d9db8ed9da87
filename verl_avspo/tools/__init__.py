"""User tools over logs and synthetic batches: ``verl-avspo report``, ``table`` and ``demo``, and the
log readers and plots they share. They read verl's logs; none imports verl's trainer."""
