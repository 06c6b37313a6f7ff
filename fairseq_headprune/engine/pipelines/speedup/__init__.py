"""``compress --target speedup=Nx`` on real models: the decision split's halves (``halves``), the plan that times
candidate shapes in the export engine (``plan``), and the attempts, each a whole compress run, with the result
(``run``)."""
