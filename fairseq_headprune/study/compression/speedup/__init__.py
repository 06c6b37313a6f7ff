"""``compress --target speedup=Nx`` as plain logic: the shapes a plan times (``shapes``), the rules that choose
among them and judge each attempt (``rules``), the attempts' state machine (``search``), the records of a run
(``records``) and its OUT/report.md (``report``)."""
