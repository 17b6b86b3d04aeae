"""In-process test doubles of what gputap's own code talks to, as strict as the real ones
wherever the code depends on them."""
