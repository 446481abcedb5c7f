"""matplotlib for every plot of the benchmarks and drills: the Agg
backend (the lab has no display), imported only when a plot is drawn, so
that the commands run without matplotlib until one is asked for."""


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
