"""The RL math and steps: rewards, advantages, losses, update, state, each family's step, the planner."""
