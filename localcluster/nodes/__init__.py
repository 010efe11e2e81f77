"""The nodes the local cluster runs on: KWOK fake nodes (``kwok``), the real kubelet node and its
images, containers' network, the simulated GPUs and their DRA driver.
"""
