"""The planner: memory, communication, bubble and step time of a parallel layout, and the search over layouts.

Pure functions and dataclasses over a model (``model``), a layout (``layout``) and a cluster
(``hardware``, with the GPU table ``gpus.json``), on the shared cost model (diagtrain.profiler.model:
bubble, bytes per parameter, collective time): ``memory``, ``comm`` and ``compute`` count what each
rank holds, sends and computes, ``estimate`` combines them for one layout, ``planner`` enumerates and
ranks layouts, ``whatif`` answers questions about a finished run (``run_model``: the run as the
analyzer measured it), ``render`` writes plans as Markdown or JSON. Imports only itself, the shared
cost model and util.
"""
