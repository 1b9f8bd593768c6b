"""The cost models and the planner: memory, communication, bubble and step time of a parallel layout.

Pure functions and dataclasses over a model (``model``), a layout (``layout``) and a cluster
(``hardware``, with the GPU table ``gpus.json``): ``memory``, ``comm``, ``pipeline`` and ``compute``
are the models, ``estimate`` combines them for one layout, ``planner`` enumerates and ranks layouts,
``measured`` reads a finished run in the same terms, ``whatif`` answers questions about that run,
``render`` writes plans as Markdown or JSON. Imports only itself, the run-directory contract and util.
"""
