"""What every stage shares: the one error users read, the metrics and their names, a drafted
token's signals, SPIDE's confidence bins, parameter values as users type them, writing and
reading files safely, where shipped data and the cache live, and the machine's load."""
