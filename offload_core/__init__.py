"""Engine side: hashing, GPU block pool, the hybrid hit rule, CPU offloading, and a
simulated engine worker. Only the data path and the engine import torch."""
