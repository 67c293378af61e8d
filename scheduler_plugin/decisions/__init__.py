"""The decisions: filter, prioritize and preempt over the state, bind, and gangs."""
