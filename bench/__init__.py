"""readyq_bench: throughput, latency and scaling measurements (`readyq bench`)."""
