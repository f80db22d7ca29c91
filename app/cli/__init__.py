"""Operations: the CLI, logging and metrics, offline evaluation on BEIR data."""
