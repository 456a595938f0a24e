"""django-scim2 wraps every view's dispatch in AUTH_CHECK_MIDDLEWARE, whose
default asks `request.user.is_authenticated` (a session would do) and logs
request bodies at DEBUG (passwords included). Here authentication is the SCIM
token's alone (sso.scim.views._authenticate, before this runs), so this
passes the request through and logs nothing."""


class ScimTokenChecked:
    def __init__(self, get_response=None):
        self.get_response = get_response

    def __call__(self, request, *args, **kwargs):
        return self.get_response(request, *args, **kwargs)
