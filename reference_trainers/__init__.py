"""Instrumented reference trainers (DDP, FSDP, TP, PP, 3D) on one small transformer, with faults.

``torchrun --nproc-per-node N -m diagtrain.reference_trainers --strategy ddp`` runs one;
``diagtrain train --strategy ddp --nproc N`` launches the same thing through torch.distributed.run.
"""
