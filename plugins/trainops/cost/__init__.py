"""What a training run cost: the accounting of its attempts into phases, goodput and money
(``accounting``), the prices it uses (``prices``), the cost before launch (``estimate``), and
the one way an amount is written (``money``).
Plain Python: neither torch nor Airflow."""
