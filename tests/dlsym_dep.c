/* dlsym_dep.c — a dependency of dlsym_plugin.c only (interpose_prog --dlsym-scope): its symbol is
 * in the plugin's scope, not in the global one. */
__attribute__((visibility("default"))) int dlsym_dep_fn(void);
int dlsym_dep_fn(void) { return 42; }
