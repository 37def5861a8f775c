"""From a target to a `Graph`: loading (files, factories, hf: presets), the capture chain
(torch.export → make_fx → dispatch recording), decomposition, the training-step capture."""
