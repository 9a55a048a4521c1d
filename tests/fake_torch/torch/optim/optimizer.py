"""FAKE torch.optim.optimizer — a test double (see tests/fake_torch/README.md): step post hooks,
per optimizer and global, with PyTorch 2.x's signature hook(optimizer, args, kwargs)."""
import itertools

_global_optimizer_post_hooks = {}
_ids = itertools.count()


class _Handle:
    def __init__(self, table, key):
        self._table, self._key = table, key

    def remove(self):
        self._table.pop(self._key, None)


def register_optimizer_step_post_hook(hook):
    key = next(_ids)
    _global_optimizer_post_hooks[key] = hook
    return _Handle(_global_optimizer_post_hooks, key)


class Optimizer:
    def __init__(self):
        self._optimizer_step_post_hooks = {}
        self.steps = 0

    def register_step_post_hook(self, hook):
        key = next(_ids)
        self._optimizer_step_post_hooks[key] = hook
        return _Handle(self._optimizer_step_post_hooks, key)

    def step(self, *args, **kwargs):
        self.steps += 1
        for hook in itertools.chain(list(self._optimizer_step_post_hooks.values()),
                                    list(_global_optimizer_post_hooks.values())):
            hook(self, args, kwargs)
