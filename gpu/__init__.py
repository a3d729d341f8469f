"""Triton kernels whose knobs mirror simfloat's emulator, a faithful CPU execution mode for Triton, and
cross-validation. Depends on simfloat; simfloat never imports gpu."""
