// The status page's static files (coordinator/web/*), compiled into the
// coordinator by CMake (web_assets.cmake): no build step, nothing to
// install next to the binary.
#ifndef MUSTER_COORDINATOR_WEB_ASSETS_H_
#define MUSTER_COORDINATOR_WEB_ASSETS_H_

namespace muster::web {

extern const char kIndexHtml[];
extern const char kLoginHtml[];
extern const char kAppJs[];
extern const char kStyleCss[];

}  // namespace muster::web

#endif  // MUSTER_COORDINATOR_WEB_ASSETS_H_
