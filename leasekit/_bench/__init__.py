"""``leasekit bench``: leasekit side by side with the raw driver and peer libraries.

One run, one server: every contender does acquire+release cycles in the same
scenarios, and the report gives cycles/s, p50/p99 latency per cycle and the ratio to
the raw-driver floor (the fewest round trips the driver needs for the same
guarantees). The package is generic and knows no backend: ``_model`` holds the data
(scenarios, contenders, results), ``_runner`` the timing loops, ``_report`` the
table and the JSON, ``_schemes`` the lookup of a scheme's floor and peers in the
``leasekit.bench`` entry-point group. Each backend ships its own bench module
(``leasekit_redis._bench``, ...), written against the public :mod:`leasekit.bench`
names and imported only when a URL of its scheme is benchmarked, so this package
costs nothing until ``leasekit bench`` runs. Its public names are those of
:mod:`leasekit.bench`, which imports them from the modules here.
"""
