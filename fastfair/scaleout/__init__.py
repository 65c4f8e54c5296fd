"""Scale-out: grids of runs, the launchers that run them, and one run over several processes (DDP)."""
