"""What a training run cost: the accounting of its attempts into phases, goodput and money
(``accounting``), the prices it uses (``prices``), and the cost before launch (``estimate``).
Plain Python: neither torch nor Airflow."""
