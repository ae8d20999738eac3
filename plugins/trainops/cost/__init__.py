"""What a training run cost: the accounting of its attempts into phases, goodput and money
(``accounting``), and the prices it uses (``prices``). Plain Python: neither torch nor Airflow."""
