// FENCELOCK_API marks a class or function of the installed libraries' API (libfencelock-client,
// libfencelock-fence, libfencelock-metrics-http). Their code is compiled with hidden visibility,
// so a declaration without the mark stays inside its shared library; a class with it exports
// its members, its vtable and its typeinfo (which a consumer needs to catch its exceptions).
// Installed as fencelock/api/export.h, with the headers that use it.
#ifndef FENCELOCK_API_EXPORT_H_
#define FENCELOCK_API_EXPORT_H_

#define FENCELOCK_API __attribute__((visibility("default")))

#endif  // FENCELOCK_API_EXPORT_H_
