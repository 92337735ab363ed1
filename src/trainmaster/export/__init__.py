"""Exports of a job to other tools' formats (not backends): torchx, the job as a TorchX
component.
"""
