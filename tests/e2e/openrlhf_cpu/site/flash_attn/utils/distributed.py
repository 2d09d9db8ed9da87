all_gather = None
