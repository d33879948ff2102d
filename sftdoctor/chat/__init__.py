"""`sftdoctor chat TARGET`: talk to a trained model with the chat template and generation config saved with it,
and see after each answer whether it ended its turn or ran to max_new_tokens (the other end of the
training-targets proof: a model never trained on its end-of-turn token never emits it)."""
