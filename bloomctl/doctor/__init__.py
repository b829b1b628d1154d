"""doctor: is this server fit for filters, and may this user run what each bloomctl command sends."""
