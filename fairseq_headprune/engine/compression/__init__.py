"""``compress`` on a loaded model: whole layers chosen by the validation loss, distillation data, and decoding
speed in deployment."""
