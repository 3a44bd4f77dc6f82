#!/usr/bin/env python3
"""The X server's view of the app's windows, through libX11 (ctypes; no packages to install).

  x11.py windows NAME   prints how many top-level windows titled NAME are viewable
  x11.py focus          prints the title of the top-level window holding the input focus ("" if none)
  x11.py unfocus        gives the input focus to the root window (so that a later focus is seen)

The desktop smoke test uses it to check that a second launch leaves one window, and focuses it.
Under Xvfb there is no window manager: top-level windows are the root's children, and GTK focuses
a window it presents with XSetInputFocus.
"""
import ctypes
import ctypes.util
import sys

Window = ctypes.c_ulong
POINTER_ROOT = 1
REVERT_TO_POINTER_ROOT = 1
IS_VIEWABLE = 2


class XWindowAttributes(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_int), ("y", ctypes.c_int), ("width", ctypes.c_int), ("height", ctypes.c_int),
        ("border_width", ctypes.c_int), ("depth", ctypes.c_int), ("visual", ctypes.c_void_p),
        ("root", Window), ("class_", ctypes.c_int), ("bit_gravity", ctypes.c_int),
        ("win_gravity", ctypes.c_int), ("backing_store", ctypes.c_int), ("backing_planes", ctypes.c_ulong),
        ("backing_pixel", ctypes.c_ulong), ("save_under", ctypes.c_int), ("colormap", ctypes.c_ulong),
        ("map_installed", ctypes.c_int), ("map_state", ctypes.c_int), ("all_event_masks", ctypes.c_long),
        ("your_event_mask", ctypes.c_long), ("do_not_propagate_mask", ctypes.c_long),
        ("override_redirect", ctypes.c_int), ("screen", ctypes.c_void_p),
    ]


x = ctypes.cdll.LoadLibrary(ctypes.util.find_library("X11") or "libX11.so.6")
x.XOpenDisplay.restype = ctypes.c_void_p
x.XOpenDisplay.argtypes = [ctypes.c_char_p]
x.XDefaultRootWindow.restype = Window
x.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
x.XQueryTree.argtypes = [ctypes.c_void_p, Window, ctypes.POINTER(Window), ctypes.POINTER(Window),
                         ctypes.POINTER(ctypes.POINTER(Window)), ctypes.POINTER(ctypes.c_uint)]
x.XFetchName.argtypes = [ctypes.c_void_p, Window, ctypes.POINTER(ctypes.c_char_p)]
x.XGetWindowAttributes.argtypes = [ctypes.c_void_p, Window, ctypes.POINTER(XWindowAttributes)]
x.XGetInputFocus.argtypes = [ctypes.c_void_p, ctypes.POINTER(Window), ctypes.POINTER(ctypes.c_int)]
x.XSetInputFocus.argtypes = [ctypes.c_void_p, Window, ctypes.c_int, ctypes.c_ulong]
x.XSync.argtypes = [ctypes.c_void_p, ctypes.c_int]
x.XFree.argtypes = [ctypes.c_void_p]

display = x.XOpenDisplay(None)
if not display:
    sys.exit("x11.py: cannot open the display (is DISPLAY set?)")
root = x.XDefaultRootWindow(display)


def tree(window):
    """(parent, children) of a window."""
    root_ret, parent = Window(), Window()
    children, count = ctypes.POINTER(Window)(), ctypes.c_uint()
    if not x.XQueryTree(display, window, ctypes.byref(root_ret), ctypes.byref(parent), ctypes.byref(children),
                        ctypes.byref(count)):
        return 0, []
    kids = [children[i] for i in range(count.value)]
    if children:
        x.XFree(children)
    return parent.value, kids


def title(window):
    name = ctypes.c_char_p()
    if x.XFetchName(display, window, ctypes.byref(name)) and name.value is not None:
        return name.value.decode(errors="replace")
    return ""


def viewable(window):
    attrs = XWindowAttributes()
    return bool(x.XGetWindowAttributes(display, window, ctypes.byref(attrs))) and attrs.map_state == IS_VIEWABLE


def toplevel(window):
    """The root's child that holds `window` (or 0 for the root itself, PointerRoot or None)."""
    while window and window not in (root, POINTER_ROOT):
        parent, _ = tree(window)
        if parent == root:
            return window
        window = parent
    return 0


command = sys.argv[1] if len(sys.argv) > 1 else ""
if command == "windows" and len(sys.argv) == 3:
    print(sum(1 for w in tree(root)[1] if viewable(w) and title(w) == sys.argv[2]))
elif command == "focus":
    focused, revert = Window(), ctypes.c_int()
    x.XGetInputFocus(display, ctypes.byref(focused), ctypes.byref(revert))
    top = toplevel(focused.value)
    print(title(top) if top else "")
elif command == "unfocus":
    x.XSetInputFocus(display, POINTER_ROOT, REVERT_TO_POINTER_ROOT, 0)
    x.XSync(display, 0)
else:
    sys.exit(__doc__)
